// Status plumbing shared by every host component: absl::Status / StatusOr everywhere fallible.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DSV4_CONCAT_INNER_(a, b) a##b
#define DSV4_CONCAT_(a, b) DSV4_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define DSV4_RETURN_IF_ERROR(expr)                  \
  do {                                              \
    ::absl::Status _dsv4_status = (expr);           \
    if (!_dsv4_status.ok()) return _dsv4_status;    \
  } while (0)

// DSV4_ASSIGN_OR_RETURN(auto x, FunctionReturningStatusOr());
#define DSV4_ASSIGN_OR_RETURN(lhs, expr) \
  DSV4_ASSIGN_OR_RETURN_IMPL_(DSV4_CONCAT_(_dsv4_statusor_, __LINE__), lhs, expr)
#define DSV4_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = std::move(tmp).value()
