#include "sim/trace/timeline_json.h"
