# tdpipe_module(NAME DEPS … PRIVATE_DEPS …): one library target per module,
# aliased as tdpipe::NAME, built from NAME/src/*.cpp, public headers in NAME/include;
# installed with its headers into the export set tdpipeTargets (find_package(tdpipe)
# gives tdpipe::NAME). The CUDA backend's headers (include/…/cuda) stay out: its
# library is the tdpipe-cuda binary's, not exported.
include(GNUInstallDirs)
function(tdpipe_module name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  if(NOT ARG_SOURCES)
    file(GLOB ARG_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/*.cpp)
  endif()
  add_library(tdpipe_${name} ${ARG_SOURCES})
  add_library(tdpipe::${name} ALIAS tdpipe_${name})
  # Consumers get C++20 (the headers need it); PIC so that a shared library may link them.
  set_target_properties(tdpipe_${name} PROPERTIES EXPORT_NAME ${name} POSITION_INDEPENDENT_CODE ON)
  target_compile_features(tdpipe_${name} PUBLIC cxx_std_20)
  target_include_directories(tdpipe_${name} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(tdpipe_${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  target_compile_options(tdpipe_${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
  install(TARGETS tdpipe_${name} EXPORT tdpipeTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          PATTERN "cuda" EXCLUDE)
endfunction()
