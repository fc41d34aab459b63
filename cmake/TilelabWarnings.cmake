# tilelab_warnings(target): the project's warning set, applied to every target we compile.
function(tilelab_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
                                           -Wno-missing-field-initializers)
endfunction()
