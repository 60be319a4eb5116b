#include "sim/plan/plan_json.h"
