# Project-wide warnings for our own targets (applied with bev_warnings(target)).
function(bev_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Werror=switch>)
  # GCC 12 at -O2/-O3 reports -Wrestrict, -Warray-bounds and -Wstringop-overflow on inlined
  # std::string code that is correct (GCC PRs 105329, 105651, 106199; fixed in 13). They are off
  # for GCC 12 only; the clang build (fuzz targets) and ASan+UBSan keep watching the same code.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict -Wno-array-bounds -Wno-stringop-overflow>)
  endif()
  if(BEV_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()

# Precompiled headers: parsing nlohmann-json (and gtest in tests) dominates compile time otherwise,
# which matters on a 2-core CI machine that builds the tree three times. C++ targets only.
function(bev_pch target)
  target_precompile_headers(${target} PRIVATE <nlohmann/json.hpp> <string> <vector> <memory> ${ARGN})
endfunction()
