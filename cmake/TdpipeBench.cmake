# tdpipe_bench_usage(TARGET SOURCE): the bench program's `--help` text is the banner
# comment at the top of its source (the lines before the first #include, without the
# `// `), generated into a header at configure time — the usage is written once, where
# the program says what it measures. bench/bench_help.hpp prints it.
function(tdpipe_bench_usage target source)
  file(READ ${source} content)
  string(REGEX MATCH "^(//[^\n]*\n)+" banner "${content}")
  string(REGEX REPLACE "(^|\n)// ?" "\\1" banner "${banner}")
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/${target}_usage)
  file(CONFIGURE OUTPUT ${dir}/bench_usage.inc CONTENT "R\"tdpipe_usage(@banner@)tdpipe_usage\"\n" @ONLY)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${source})
  target_include_directories(${target} PRIVATE ${dir} ${PROJECT_SOURCE_DIR}/bench)
endfunction()
