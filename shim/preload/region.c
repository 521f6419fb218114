/*
 * region.c: krex_region_begin()/krex_region_end() for C and C++ benchmarks.
 *
 * Exported now so that programs can be written against the final interface; the controller
 * issue connects them to the daemon. Until then they do nothing and return 0, which is also
 * what they do outside krex.
 */
#include "shim.h"

KREX_EXPORT int krex_region_begin(void)
{
    krex_debug("krex_region_begin: not connected to a controller yet (no-op)");
    return 0;
}

KREX_EXPORT int krex_region_end(void)
{
    krex_debug("krex_region_end: not connected to a controller yet (no-op)");
    return 0;
}
