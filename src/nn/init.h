// Initialization rules for parameters. A module declares each parameter with its rule;
// Module::initialize applies the rules later, once the parallel plan has decided where and how
// the parameters live (DESIGN.md §2: describe -> shard -> allocate -> initialize).
#pragma once

#include <functional>
#include <string>

#include "src/base/rng.h"
#include "src/core/tensor.h"

namespace vlm::nn {

struct Init {
  enum class Kind : uint8_t { keep, constant, normal, uniform, custom };
  // Fills a parameter in place (CPU, its own dtype) from the given generator.
  using Fn = std::function<void(Tensor& param, Rng& rng)>;

  Kind kind = Kind::keep;
  double a = 0; // constant: the value; normal: mean; uniform: lower bound
  double b = 0; // normal: std; uniform: upper bound
  Fn fn;        // custom only

  // Leaves the values as they are (a tensor registered with its values, or loaded later).
  static Init keep() { return {}; }
  static Init constant(double value) { return {Kind::constant, value, 0, {}}; }
  static Init zeros() { return constant(0.0); }
  static Init ones() { return constant(1.0); }
  static Init normal(double std, double mean = 0.0) { return {Kind::normal, mean, std, {}}; }
  static Init uniform(double lo, double hi) { return {Kind::uniform, lo, hi, {}}; }
  static Init custom(Fn fn) { return {Kind::custom, 0, 0, std::move(fn)}; }

  // "normal(mean=0, std=0.02)", for summaries and error messages.
  std::string str() const;
  // Applies the rule to `param` (draws from rng in row-major order for random rules).
  void apply(Tensor& param, Rng& rng) const;
};

} // namespace vlm::nn
