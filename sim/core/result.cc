#include "sim/core/result.h"

namespace offsim::sim {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidInput:
      return "invalid input";
    case ErrorCode::kNotFound:
      return "not found";
    case ErrorCode::kIo:
      return "i/o error";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kNoDevice:
      return "no device";
    case ErrorCode::kDevice:
      return "device error";
    case ErrorCode::kLimitExceeded:
      return "limit exceeded";
    case ErrorCode::kCancelled:
      return "cancelled";
    case ErrorCode::kInternal:
      return "internal error";
  }
  return "unknown error";
}

}  // namespace offsim::sim
