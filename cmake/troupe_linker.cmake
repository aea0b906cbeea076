# TROUPE_LINKER: AUTO (lld when the compiler can link with it, else the default), lld, or
# default. lld links the test programs about three times faster than GNU ld, which is a
# quarter of a sanitized build on two cores; the programs are the same.
set(TROUPE_LINKER "AUTO" CACHE STRING "Linker: AUTO (lld if usable), lld, or default")
set_property(CACHE TROUPE_LINKER PROPERTY STRINGS AUTO lld default)
if(TROUPE_LINKER STREQUAL "AUTO" OR TROUPE_LINKER STREQUAL "lld")
  include(CheckLinkerFlag)
  check_linker_flag(CXX "-fuse-ld=lld" TROUPE_LLD_WORKS)
  if(TROUPE_LLD_WORKS)
    add_link_options($<$<LINK_LANGUAGE:CXX,C>:-fuse-ld=lld>)
    message(STATUS "troupe: linking with lld")
  elseif(TROUPE_LINKER STREQUAL "lld")
    message(FATAL_ERROR "TROUPE_LINKER=lld, but '${CMAKE_CXX_COMPILER} -fuse-ld=lld' cannot "
                        "link: install lld (scripts/install-deps.sh does), or use AUTO")
  endif()
elseif(NOT TROUPE_LINKER STREQUAL "default")
  message(FATAL_ERROR "TROUPE_LINKER='${TROUPE_LINKER}': use AUTO, lld or default")
endif()
