// The losses a student learns from, one row each as the teacher's ops have theirs: the
// distillation losses (kd.loss) with the parameters each reads, and the feature losses
// (kd.features' `loss`). The rows and their functions are in losses.cpp; the configuration's
// choices and parameter keys are read from here (the app's run_schema), so adding a loss is a
// row there and nothing else.
#pragma once

#include <string>
#include <vector>

namespace kdflow::student {

// A number a distillation loss reads: configured as kd.<loss>_<name> (kd.dkd_alpha).
struct LossParam {
  std::string name;
  double default_value = 0;
  double min = 0, max = 1e300;
  std::string doc;
};

struct KdLossInfo {
  std::string name; // kd.loss's value
  std::string doc;  // one line for the configuration's help
  std::vector<LossParam> params;
};

struct FeatureLossInfo {
  std::string name; // a kd.features row's `loss`
  std::string doc;
};

const std::vector<KdLossInfo>& kd_losses();
const std::vector<FeatureLossInfo>& feature_losses();

// The configuration key of a distillation loss's parameter: kd.<loss>_<param>.
std::string kd_param_key(const std::string& loss, const std::string& param);

} // namespace kdflow::student
