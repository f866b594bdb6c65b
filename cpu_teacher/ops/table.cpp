// The one op table: every family's entries, sorted by name and indexed for find_op. A new op goes
// into its family's kOps beside its functions; a new family file adds its line to kFamilies.
#include "op_table.hpp"

#include "kdflow/cpu_teacher/ops.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

namespace kdflow::teacher {
namespace {

struct Table {
  std::vector<const OpDef*> sorted;
  std::map<std::string_view, const OpDef*, std::less<>> by_name;
};

const Table& table() {
  static const Table t = [] {
    constexpr std::span<const OpDef> (*kFamilies[])() = {
        activation_ops, binary_ops, conv_ops,  folding_ops,
        gemm_ops,       pool_ops,   shape_ops, softmax_ops,
    };
    Table r;
    for (const auto family : kFamilies)
      for (const OpDef& op : family()) {
        // Every entry needs a shape rule and a reference: import folds and checks with them.
        if (op.infer == nullptr || op.evaluate == nullptr ||
            !r.by_name.emplace(op.name, &op).second)
          throw std::logic_error("op table: entry '" + std::string(op.name) +
                                 "' is declared twice or lacks its shape rule or reference");
        r.sorted.push_back(&op);
      }
    std::sort(r.sorted.begin(), r.sorted.end(),
              [](const OpDef* a, const OpDef* b) { return a->name < b->name; });
    return r;
  }();
  return t;
}

} // namespace

const OpDef* find_op(std::string_view op) {
  const auto& by_name = table().by_name;
  const auto it = by_name.find(op);
  return it == by_name.end() ? nullptr : it->second;
}

std::span<const OpDef* const> op_table() { return table().sorted; }

std::vector<OpInfo> teacher_ops() {
  std::vector<OpInfo> out;
  for (const OpDef* op : op_table()) out.push_back({std::string(op->name), op->lower != nullptr});
  return out;
}

} // namespace kdflow::teacher
