// Context::state: per-rank state of upper layers, one object per type.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "runtime/context.h"

using namespace meshrt;

namespace {
// Two layers' state types; each records its destruction into a shared log.
struct LayerA {
  LayerA(std::vector<char>* l, int v) : log(l), value(v) {}
  ~LayerA() { log->push_back('A'); }
  std::vector<char>* log;
  int value;
};
struct LayerB {
  explicit LayerB(std::vector<char>* l) : log(l) {}
  ~LayerB() { log->push_back('B'); }
  std::vector<char>* log;
};
}  // namespace

TEST_CASE("Context::state keeps one object per type, made once, freed in reverse order",
          "[context]") {
  std::vector<char> log;
  int made_a = 0, made_b = 0;
  {
    Context ctx(Device::cpu());
    auto make_a = [&] {
      ++made_a;
      return std::make_shared<LayerA>(&log, 7);
    };
    LayerA& a1 = ctx.state<LayerA>(make_a);
    LayerA& a2 = ctx.state<LayerA>(make_a);
    REQUIRE(&a1 == &a2);
    REQUIRE(made_a == 1);
    REQUIRE(a2.value == 7);
    a1.value = 11;
    LayerB& b = ctx.state<LayerB>([&] {
      ++made_b;
      return std::make_shared<LayerB>(&log);
    });
    REQUIRE(static_cast<void*>(&b) != static_cast<void*>(&a1));
    REQUIRE(made_b == 1);
    REQUIRE(ctx.state<LayerA>(make_a).value == 11);
    REQUIRE(made_a == 1);
    REQUIRE(log.empty());
  }
  // LayerB was created last, so it goes first.
  REQUIRE(log == std::vector<char>{'B', 'A'});
}
