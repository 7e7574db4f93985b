// Small status helpers. Abseil 20220623 (Debian 12) ships no
// RETURN_IF_ERROR / ASSIGN_OR_RETURN, so we define the two we use.
#ifndef SERVESIM_COMMON_STATUS_MACROS_H_
#define SERVESIM_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SERVESIM_CONCAT_INNER_(a, b) a##b
#define SERVESIM_CONCAT_(a, b) SERVESIM_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` is not OK.
#define RETURN_IF_ERROR(expr)                         \
  do {                                                \
    if (absl::Status _st = (expr); !_st.ok()) {       \
      return _st;                                     \
    }                                                 \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, F())` binds x to F()'s value or returns its
// status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  SERVESIM_ASSIGN_OR_RETURN_IMPL_(SERVESIM_CONCAT_(_statusor_, __LINE__), lhs, expr)

#define SERVESIM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (!tmp.ok()) return std::move(tmp).status();        \
  lhs = std::move(tmp).value()

#endif  // SERVESIM_COMMON_STATUS_MACROS_H_
