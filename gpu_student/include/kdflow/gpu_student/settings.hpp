// The names of the student's enum-like settings, in one place: what their parsers read
// (resolve_device, resolve_amp, ProcessGroup) and what the configuration offers
// (student.device, train.amp, dist.backend), without torch.
#pragma once

#include <string>
#include <vector>

namespace kdflow::student {

const std::vector<std::string>& device_names();  // auto, cpu, cuda
const std::vector<std::string>& amp_names();     // auto, off, bf16, fp16
const std::vector<std::string>& backend_names(); // auto, nccl, gloo

// `value` among `names`, or InputError "`key` = value: not a, b or c".
void check_name(const std::string& key, const std::string& value,
                const std::vector<std::string>& names);

} // namespace kdflow::student
