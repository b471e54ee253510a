#include "model/model_spec.h"

#include <set>
#include <sstream>

#include "runtime/error.h"

namespace meshrt {

int64_t ModelSpec::params() const {
  int64_t per_layer = 0;
  for (PieceKind piece : layer_pieces(kind))
    for (int64_t n : piece_param_counts(piece, hidden, ffn)) per_layer += n;
  int64_t p = per_layer * layers;
  if (vocab > 0) p += 2 * vocab * hidden + 2 * hidden;  // embedding, LM head (untied), final norm
  return p;
}

DType parse_model_dtype(std::string_view s) {
  if (s == "f32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "f16") return DType::f16;
  MESHRT_FAIL("dtype '" << s << "': use f32, bf16 or f16");
}

namespace {

// One key=value of a --model string into m; `given` records which keys came.
void set_model_key(ModelSpec& m, const std::string& s, const std::string& flag,
                   const std::string& k, const std::string& v, std::set<std::string>& given) {
  if (k == "kind") {
    MESHRT_CHECK(v == "block" || v == "mlp" || v == "attn",
                 flag << " " << s << ": kind=" << v << " must be block, mlp or attn");
    m.kind = parse_layer_kind(v);
    return;
  }
  int64_t x = 0;
  size_t used = 0;
  try {
    x = std::stoll(v, &used);
  } catch (...) {
    used = 0;
  }
  MESHRT_CHECK(used == v.size() && x > 0 && x <= kModelMaxSize,
               flag << " " << s << ": " << k << "=" << v << " must be a positive integer (1 to "
                    << kModelMaxSize << ")");
  if (k == "hidden") {
    m.hidden = x;
  } else if (k == "heads") {
    m.heads = x;
  } else if (k == "ffn") {
    m.ffn = x;
  } else if (k == "layers") {
    MESHRT_CHECK(x <= kModelMaxLayers, flag << " " << s << ": layers=" << x << " is more than "
                                            << kModelMaxLayers << "; give 1 to " << kModelMaxLayers
                                            << " layers");
    m.layers = static_cast<int>(x);
  } else if (k == "seq") {
    m.seq = x;
  } else if (k == "vocab") {
    m.vocab = x;
  } else {
    MESHRT_FAIL(flag << " " << s << ": unknown key '" << k
                     << "'; the keys are hidden, heads, ffn, layers, seq, vocab, kind");
  }
  given.insert(k);
}

}  // namespace

ModelSpec parse_model_spec(const std::string& s, const std::string& flag) {
  ModelSpec m;
  std::set<std::string> seen, given;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t eq = item.find('=');
    MESHRT_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < item.size(),
                 flag << " " << s << ": '" << item
                      << "' is not key=value; give hidden=..,heads=..,ffn=..,layers=..,"
                         "seq=..,vocab=..");
    const std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    MESHRT_CHECK(seen.insert(k).second,
                 flag << " " << s << ": '" << k << "' is given twice; give each key once");
    set_model_key(m, s, flag, k, v, given);
  }
  MESHRT_CHECK(given.count("hidden") && given.count("heads") && given.count("seq"),
               flag << " " << s << ": hidden, heads and seq are required");
  if (!given.count("ffn")) m.ffn = 4 * m.hidden;
  MESHRT_CHECK(m.hidden % m.heads == 0, flag << " " << s << ": hidden " << m.hidden
                                             << " does not divide by heads " << m.heads);
  // The counts are int64 products (hidden x ffn, layers x per-layer): a bound on their sum (every
  // layer kind's, in long double) keeps each of them exact, far from overflow.
  const long double h = static_cast<long double>(m.hidden), f = static_cast<long double>(m.ffn);
  const long double count = m.layers * (4 * h * h + 2 * h * f + 9 * h + f) +
                            2 * static_cast<long double>(m.vocab) * h + 2 * h;
  constexpr long double kMaxParams = 9007199254740992.0L;  // 2^53
  MESHRT_CHECK(count <= kMaxParams,
               flag << " " << s << ": about " << static_cast<double>(count)
                    << " parameters, more than the planner counts (at most 2^53 = "
                    << static_cast<int64_t>(kMaxParams) << "); lower hidden, ffn, layers or vocab");
  return m;
}

}  // namespace meshrt
