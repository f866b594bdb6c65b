// The one op table: every family's entries, sorted by name and indexed for find_op. A new op goes
// into its family's kOps beside its functions; a new family file adds its line to kFamilies.
#include "op_table.hpp"

#include "kdflow/cpu_teacher/ops.hpp"

#include <map>
#include <stdexcept>
#include <string>

namespace kdflow::teacher {
namespace {

// By name (which also sorts teacher_ops()).
using Table = std::map<std::string_view, const OpDef*, std::less<>>;

const Table& table() {
  static const Table t = [] {
    constexpr std::span<const OpDef> (*kFamilies[])() = {
        activation_ops, binary_ops, conv_ops,   folding_ops, gemm_ops,    indexing_ops,
        norm_ops,       pool_ops,   resize_ops, shape_ops,   softmax_ops,
    };
    Table r;
    for (const auto family : kFamilies)
      for (const OpDef& op : family())
        // Every entry needs a shape rule and a reference: import folds and checks with them.
        if (op.infer == nullptr || op.evaluate == nullptr || !r.emplace(op.name, &op).second)
          throw std::logic_error("op table: entry '" + std::string(op.name) +
                                 "' is declared twice or lacks its shape rule or reference");
    return r;
  }();
  return t;
}

} // namespace

const OpDef* find_op(std::string_view op) {
  const auto it = table().find(op);
  return it == table().end() ? nullptr : it->second;
}

std::vector<OpInfo> teacher_ops() {
  std::vector<OpInfo> out;
  for (const auto& [name, op] : table()) out.push_back({std::string(name), op->lower != nullptr});
  return out;
}

} // namespace kdflow::teacher
