// All tensor-level ops (one header per family under src/core/ops/).
#pragma once

#include "src/core/autograd.h"
#include "src/core/ops/activation.h"
#include "src/core/ops/attention.h"
#include "src/core/ops/conv1d.h"
#include "src/core/ops/elementwise.h"
#include "src/core/ops/gated_delta.h"
#include "src/core/ops/index.h"
#include "src/core/ops/loss.h"
#include "src/core/ops/matmul.h"
#include "src/core/ops/norm.h"
#include "src/core/ops/reduce.h"
#include "src/core/ops/rope.h"
#include "src/core/ops/shape_ops.h"
