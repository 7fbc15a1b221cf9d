# transform.cmake — kernels.cu as host C++ for the SIMT emulation (simt.hpp):
#   cmake -DIN=kernels.cu -DOUT=kernels_simt.cpp -P transform.cmake
# rewrites each launch `k<<<grid, block, smem, stream>>>(args)` (k possibly `k<T>`) as
# `::simt::launch(k, grid, block, smem, stream)(args)`; everything else is kept.
file(READ "${IN}" text)
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_]*(<[A-Za-z0-9_]+>)?)<<<([^>]*)>>>\\("
       "::simt::launch(\\1, \\3)(" text "${text}")
string(FIND "${text}" "<<<" left)
if(NOT left EQUAL -1)
  message(FATAL_ERROR "${IN}: a kernel launch transform.cmake cannot rewrite remains")
endif()
file(WRITE "${OUT}.tmp" "// Generated from ${IN} by transform.cmake: do not edit.\n#line 1 \"${IN}\"\n${text}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
