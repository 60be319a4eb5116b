#include "sim/engine/simulator.h"
