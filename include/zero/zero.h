#pragma once
// The umbrella header of zero.
#include "zero/accelerate.h"
#include "zero/activation_checkpointing.h"
#include "zero/comm.h"
#include "zero/config.h"
#include "zero/engine.h"
#include "zero/error.h"
#include "zero/init.h"
#include "zero/log.h"
#include "zero/mesh.h"
#include "zero/sequence_parallel.h"
#include "zero/tensor_parallel.h"
#include "zero/unit.h"
