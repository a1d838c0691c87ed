// Checking that a call fails the way the engine promises: a bev::Error of the expected kind whose
// message names what was wrong.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "bevformer/error.h"

namespace bev::test {

// `call()` must throw bev::Error of `kind` with `needle` in its message.
template <typename Call>
void expect_error(ErrorKind kind, Call&& call, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

template <typename Call>
void expect_invalid_input(Call&& call, const std::string& needle) {
  expect_error(ErrorKind::kInvalidInput, std::forward<Call>(call), needle);
}

}  // namespace bev::test
