// The message of the InputError that `f` throws, checked to be one line (a failure if it throws
// none): the shape every bad-input test of the readers expects.
#pragma once

#include "kdflow/core/error.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace kdflow::test {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    return e.what();
  }
  ADD_FAILURE() << "no InputError";
  return {};
}

} // namespace kdflow::test
