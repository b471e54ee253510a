#include "collectives/fault.h"

#include <charconv>
#include <sstream>

#include "runtime/error.h"

namespace meshrt::detail {

const char* fault_kind_name(FaultKind k) {
  switch (k) {
    case FaultKind::None:
      return "none";
    case FaultKind::Crash:
      return "crash";
    case FaultKind::Hang:
      return "hang";
    case FaultKind::Slow:
      return "slow";
    case FaultKind::Skip:
      return "skip";
    case FaultKind::Corrupt:
      return "corrupt";
  }
  return "?";
}

std::string FaultSpec::str() const {
  if (!active()) return "";
  std::ostringstream os;
  os << fault_kind_name(kind) << "@rank=" << rank << ",step=" << step;
  if (has_op) os << ",op=" << comm_op_name(op);
  if (kind == FaultKind::Slow) os << ",ms=" << ms;
  return os.str();
}

namespace {

constexpr const char* kForm =
    "the form is kind@rank=R,step=S[,op=NAME][,ms=T] with kind crash|hang|slow|skip|corrupt, "
    "e.g. hang@rank=1,step=3";

// Printable copy of user input for messages (bounded, control characters escaped).
std::string shown(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 80)) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  if (s.size() > 80) out += "...";
  return out;
}

int64_t parse_int(std::string_view spec, std::string_view key, std::string_view v, int64_t lo,
                  int64_t hi) {
  int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  MESHRT_CHECK(ec == std::errc() && p == v.data() + v.size() && x >= lo && x <= hi,
               "MESHRT_FAULT='" << shown(spec) << "': " << key << "='" << shown(v)
                                << "' is not an integer in [" << lo << ", " << hi << "]");
  return x;
}

}  // namespace

FaultSpec parse_fault_spec(std::string_view spec) {
  FaultSpec f;
  if (spec.empty()) return f;
  const size_t at = spec.find('@');
  MESHRT_CHECK(at != std::string_view::npos,
               "MESHRT_FAULT='" << shown(spec) << "' has no '@': " << kForm);
  const std::string_view kind = spec.substr(0, at);
  if (kind == "crash") {
    f.kind = FaultKind::Crash;
  } else if (kind == "hang") {
    f.kind = FaultKind::Hang;
  } else if (kind == "slow") {
    f.kind = FaultKind::Slow;
  } else if (kind == "skip") {
    f.kind = FaultKind::Skip;
  } else if (kind == "corrupt") {
    f.kind = FaultKind::Corrupt;
  } else {
    MESHRT_FAIL("MESHRT_FAULT='" << shown(spec) << "': unknown fault kind '" << shown(kind)
                                 << "': use crash, hang, slow, skip or corrupt");
  }
  bool has_rank = false, has_step = false, has_ms = false;
  std::string_view rest = spec.substr(at + 1);
  for (bool more = true; more;) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    more = comma != std::string_view::npos;
    rest = more ? rest.substr(comma + 1) : std::string_view();
    const size_t eq = item.find('=');
    MESHRT_CHECK(eq != std::string_view::npos && eq > 0, "MESHRT_FAULT='"
                                                             << shown(spec) << "': '" << shown(item)
                                                             << "' is not key=value: " << kForm);
    const std::string_view key = item.substr(0, eq), val = item.substr(eq + 1);
    auto once = [&](bool& seen) {
      MESHRT_CHECK(!seen, "MESHRT_FAULT='" << shown(spec) << "': " << key << " given twice");
      seen = true;
    };
    if (key == "rank") {
      once(has_rank);
      f.rank = static_cast<int>(parse_int(spec, key, val, 0, 1 << 24));
    } else if (key == "step") {
      once(has_step);
      f.step = static_cast<uint64_t>(parse_int(spec, key, val, 1, int64_t{1} << 40));
    } else if (key == "op") {
      once(f.has_op);
      if (val == "barrier") {
        f.op = CommOp::Barrier;
      } else {
        try {
          f.op = parse_comm_op(val);
        } catch (const Error&) {
          MESHRT_FAIL("MESHRT_FAULT='" << shown(spec) << "': op='" << shown(val)
                                       << "' is not a collective: use all_reduce, all_gather, "
                                          "reduce_scatter, broadcast, all_to_all or barrier");
        }
      }
    } else if (key == "ms") {
      once(has_ms);
      f.ms = parse_int(spec, key, val, 1, 3600 * 1000);
    } else {
      MESHRT_FAIL("MESHRT_FAULT='" << shown(spec) << "': unknown key '" << shown(key)
                                   << "': use rank, step, op, ms");
    }
  }
  MESHRT_CHECK(has_rank && has_step,
               "MESHRT_FAULT='" << shown(spec) << "': rank= and step= are required: " << kForm);
  MESHRT_CHECK(has_ms == (f.kind == FaultKind::Slow),
               "MESHRT_FAULT='" << shown(spec) << "': "
                                << (has_ms ? "ms= applies to slow only"
                                           : "slow needs ms=T (the delay in milliseconds)"));
  return f;
}

}  // namespace meshrt::detail
