// All tensor-level ops (one header per family under src/core/ops/).
#pragma once

#include "src/core/autograd.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/matmul.h"
#include "src/core/ops/reduce.h"
#include "src/core/ops/shape_ops.h"
