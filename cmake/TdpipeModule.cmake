# tdpipe_module(NAME DEPS … PRIVATE_DEPS …): one library target per module,
# aliased as tdpipe::NAME, built from NAME/src/*.cpp, public headers in NAME/include.
function(tdpipe_module name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  if(NOT ARG_SOURCES)
    file(GLOB ARG_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/*.cpp)
  endif()
  add_library(tdpipe_${name} ${ARG_SOURCES})
  add_library(tdpipe::${name} ALIAS tdpipe_${name})
  target_include_directories(tdpipe_${name} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>)
  target_link_libraries(tdpipe_${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  target_compile_options(tdpipe_${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
endfunction()
