#include "kernels/gemm_algos.h"

#include <sstream>

#include "runtime/error.h"

namespace meshrt::kernels {

std::vector<int> usable_algos(const std::vector<AlgoCandidate>& cands, const std::string& problem) {
  std::vector<int> out;
  std::ostringstream states;
  for (size_t i = 0; i < cands.size(); ++i) {
    if (cands[i].usable) {
      out.push_back(static_cast<int>(i));
    } else {
      states << (states.tellp() > 0 ? ", " : "") << "#" << i << " " << cands[i].state;
    }
  }
  MESHRT_CHECK(!out.empty(), "op gemm: no algorithm for "
                                 << problem << " ("
                                 << (cands.empty() ? "none returned" : states.str()) << ")");
  return out;
}

size_t run_with_fallback(const std::vector<int>& order, size_t first,
                         const std::function<std::string(int)>& try_algo,
                         const std::string& problem) {
  std::ostringstream failures;
  for (size_t pos = first; pos < order.size(); ++pos) {
    const std::string st = try_algo(order[pos]);
    if (st.empty()) return pos;
    failures << (failures.tellp() > 0 ? ", " : "") << "algorithm #" << order[pos] << " " << st;
  }
  MESHRT_FAIL("op gemm: every algorithm failed for " << problem << " (" << failures.str() << ")");
}

std::string gemm_problem_str(int64_t m, int64_t n, int64_t k, int64_t batch, bool trans_a,
                             bool trans_b, const std::string& in, const std::string& out,
                             const std::string& bias) {
  std::ostringstream os;
  os << "m=" << m << " n=" << n << " k=" << k << " batch=" << batch << " " << in << " x " << in
     << " -> " << out;
  if (!bias.empty()) os << " + bias " << bias;
  if (trans_a) os << ", A transposed";
  if (trans_b) os << ", B transposed";
  return os.str();
}

}  // namespace meshrt::kernels
