// Status strings, the thread's last error, the exception boundary, init / version, the log
// callback and the handle registry.
#include <cstdio>
#include <new>
#include <system_error>

#include "capi/capi_internal.h"
#include "dist/environment.h"
#include "meshrt/version.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/logging.h"

namespace meshrt::capi {

namespace {

thread_local std::string tls_last_error;

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// A CommError raised because a rank did not arrive in time (watchdog, rendezvous) rather than
// because a peer failed or the communicator was aborted.
bool is_timeout(const std::string& msg) {
  return contains(msg, "did not complete within") || contains(msg, "never wrote") ||
         contains(msg, "never arrived") || contains(msg, "timed out") ||
         contains(msg, "never connected") || contains(msg, "could not reach rank 0");
}

}  // namespace

void fail(meshrt_status_t status, const std::string& message) {
  throw StatusError(status, message);
}

meshrt_status_t set_error(meshrt_status_t status, const char* fn, const std::string& message) {
  try {
    tls_last_error = std::string(fn) + ": " + message;
  } catch (...) {
    // out of memory for the message itself: keep the status
  }
  return status;
}

meshrt_status_t status_from_current_exception(const char* fn) {
  try {
    throw;
  } catch (const StatusError& e) {
    return set_error(e.status(), fn, e.what());
  } catch (const CommError& e) {
    return set_error(is_timeout(e.message()) ? MESHRT_ERROR_TIMEOUT : MESHRT_ERROR_COMM, fn,
                     e.message());
  } catch (const OutOfMemoryError& e) {
    return set_error(MESHRT_ERROR_OUT_OF_MEMORY, fn, e.message());
  } catch (const SystemError& e) {
    return set_error(MESHRT_ERROR_SYSTEM, fn, e.message());
  } catch (const Error& e) {
    // A check of meshrt's core refused what the call was given (tensors that do not fit the
    // call: sizes, dtypes, overlap, a u8 reduction; a spec): the message says why. The C API's
    // own checks raise StatusError with the status meshrt.h's rule gives (INVALID_USAGE for
    // calls out of order and dead handles).
    return set_error(MESHRT_ERROR_INVALID_ARGUMENT, fn, e.message());
  } catch (const std::bad_alloc&) {
    return set_error(MESHRT_ERROR_OUT_OF_MEMORY, fn,
                     "out of memory (std::bad_alloc): free memory or use smaller tensors");
  } catch (const std::system_error& e) {
    return set_error(MESHRT_ERROR_SYSTEM, fn, std::string("system error: ") + e.what());
  } catch (const std::exception& e) {
    return set_error(MESHRT_ERROR_INTERNAL, fn,
                     std::string("internal error (please report): ") + e.what());
  } catch (...) {
    return set_error(MESHRT_ERROR_INTERNAL, fn,
                     "internal error (please report): an exception of unknown type");
  }
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Comm:
      return "communicator";
    case Kind::Stream:
      return "stream";
    case Kind::Event:
      return "event";
    case Kind::Tensor:
      return "tensor";
    case Kind::Mesh:
      return "mesh";
    case Kind::Mlp:
      return "mlp";
    case Kind::Attn:
      return "attn";
  }
  return "handle";
}

Registry& Registry::get() {
  static Registry* r = new Registry();  // never destroyed: handles may be released at exit
  return *r;
}

void* Registry::add(Kind kind, std::shared_ptr<void> obj) {
  void* h = obj.get();
  std::lock_guard<std::mutex> lk(mu_);
  live_[h] = {kind, std::move(obj)};
  return h;
}

std::shared_ptr<void> Registry::find(const void* h, Kind kind, const char* what) {
  CAPI_CHECK(h != nullptr, MESHRT_ERROR_INVALID_ARGUMENT,
             what << " is NULL: pass a " << kind_name(kind) << " handle created by meshrt");
  std::lock_guard<std::mutex> lk(mu_);
  auto it = live_.find(h);
  CAPI_CHECK(it != live_.end(), MESHRT_ERROR_INVALID_USAGE,
             what << " (" << h << ") is not a live " << kind_name(kind)
                  << " handle: it was destroyed or never created by meshrt");
  CAPI_CHECK(it->second.first == kind, MESHRT_ERROR_INVALID_USAGE,
             what << " (" << h << ") is a " << kind_name(it->second.first) << " handle, not a "
                  << kind_name(kind) << " handle");
  return it->second.second;
}

std::shared_ptr<void> Registry::remove(const void* h, Kind kind) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = live_.find(h);
  if (it == live_.end() || it->second.first != kind) return nullptr;
  std::shared_ptr<void> obj = std::move(it->second.second);
  live_.erase(it);
  return obj;
}

std::atomic<bool>& initialized() {
  static std::atomic<bool> v{false};
  return v;
}

void check_environment_variables() {
  try {
    validate_environment();
  } catch (const Error& e) {
    fail(MESHRT_ERROR_INVALID_ARGUMENT, e.message());
  }
}

void require_init() {
  CAPI_CHECK(initialized().load(), MESHRT_ERROR_INVALID_USAGE,
             "meshrt_init was not called (or refused the version): call "
             "meshrt_init(MESHRT_API_VERSION) once before creating communicators");
}

}  // namespace meshrt::capi

using namespace meshrt;
using namespace meshrt::capi;

extern "C" {

const char* meshrt_status_string(meshrt_status_t status) {
  switch (status) {
    case MESHRT_SUCCESS:
      return "success";
    case MESHRT_ERROR_INVALID_ARGUMENT:
      return "invalid argument";
    case MESHRT_ERROR_INVALID_USAGE:
      return "invalid usage";
    case MESHRT_ERROR_UNSUPPORTED:
      return "unsupported";
    case MESHRT_ERROR_SYSTEM:
      return "system error";
    case MESHRT_ERROR_INTERNAL:
      return "internal error";
    case MESHRT_ERROR_COMM:
      return "communication error";
    case MESHRT_ERROR_TIMEOUT:
      return "timeout";
    case MESHRT_ERROR_OUT_OF_MEMORY:
      return "out of memory";
  }
  return "unknown status";
}

const char* meshrt_last_error(void) { return tls_last_error.c_str(); }

meshrt_status_t meshrt_init(int api_version) {
  return guarded(__func__, [&] {
    CAPI_CHECK(api_version == MESHRT_API_VERSION, MESHRT_ERROR_INVALID_USAGE,
               "the caller was built against meshrt C API version "
                   << api_version << " but this library implements version " << MESHRT_API_VERSION
                   << ": rebuild the caller against this library's meshrt.h (or load the "
                      "library of version "
                   << api_version << ")");
    // A bad MESHRT_ value is refused here, not where it is first read (a stream's worker
    // thread, an exit handler), where it could not be returned; unknown names warn once.
    check_environment_variables();
    initialized().store(true);
  });
}

meshrt_status_t meshrt_get_version(int* major, int* minor, int* patch) {
  if (major) *major = MESHRT_VERSION_MAJOR;
  if (minor) *minor = MESHRT_VERSION_MINOR;
  if (patch) *patch = MESHRT_VERSION_PATCH;
  return MESHRT_SUCCESS;
}

int meshrt_get_api_version(void) { return MESHRT_API_VERSION; }

meshrt_status_t meshrt_set_log_callback(meshrt_log_fn fn, void* user_data,
                                        meshrt_log_level_t level) {
  return guarded(__func__, [&] {
    const int lv = static_cast<int>(level);
    CAPI_CHECK(lv >= MESHRT_LOG_TRACE && lv <= MESHRT_LOG_OFF, MESHRT_ERROR_INVALID_ARGUMENT,
               "level " << lv << " is not a meshrt_log_level_t: use MESHRT_LOG_TRACE (0) .. "
                        << "MESHRT_LOG_OFF (5)");
    set_log_level(static_cast<LogLevel>(lv));
    if (!fn) {
      set_log_sink(nullptr);
      return;
    }
    set_log_sink([fn, user_data](LogLevel l, int rank, int, const std::string& msg) {
      fn(static_cast<meshrt_log_level_t>(static_cast<int>(l)), rank, msg.c_str(), user_data);
    });
  });
}

}  // extern "C"
