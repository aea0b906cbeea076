# TROUPE_SANITIZE="address;undefined" or "thread" instruments every target of the build.
if(TROUPE_SANITIZE)
  if("thread" IN_LIST TROUPE_SANITIZE AND "address" IN_LIST TROUPE_SANITIZE)
    message(FATAL_ERROR "TROUPE_SANITIZE: ThreadSanitizer and AddressSanitizer cannot be "
                        "combined; configure two builds (presets 'asan' and 'tsan').")
  endif()
  list(JOIN TROUPE_SANITIZE "," _troupe_san)
  message(STATUS "troupe: building with -fsanitize=${_troupe_san}")
  # C and C++ only: nvcc (the GPU suites' test kernels) takes none of these flags, and the
  # kernels' host code has nothing to instrument.
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${_troupe_san};-fno-omit-frame-pointer>")
  # Reports name files and lines: line tables at least, where the build type has no -g.
  string(TOUPPER "${CMAKE_BUILD_TYPE}" _troupe_type)
  if(NOT "${CMAKE_CXX_FLAGS} ${CMAKE_CXX_FLAGS_${_troupe_type}}" MATCHES "(^| )-g")
    add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-g1>)
  endif()
  add_link_options(-fsanitize=${_troupe_san})
  if("thread" IN_LIST TROUPE_SANITIZE AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # g++ warns (-Wtsan) for every std::atomic_thread_fence it sees, and Asio's headers use
    # them. troupe's own code has no standalone fences; the warning only adds noise.
    add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-Wno-tsan>)
  endif()
  if("undefined" IN_LIST TROUPE_SANITIZE)
    add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=undefined>)
  endif()
endif()
