# Warnings for every troupe target: troupe_set_warnings(target).
function(troupe_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow=local
                         -Wnon-virtual-dtor -Wcast-align -Woverloaded-virtual)
endfunction()

# Defines a troupe library target in the current folder, with warnings, include paths
# and installation. Usage: troupe_add_library(name SOURCES ... HEADERS ... DEPENDS ...)
function(troupe_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;HEADERS;PUBLIC_DEPENDS;PRIVATE_DEPENDS" ${ARGN})
  set(target troupe_${name})
  add_library(${target} STATIC ${ARG_SOURCES})
  add_library(troupe::${name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name} OUTPUT_NAME troupe_${name})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${TROUPE_BUILD_INCLUDE_DIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${target} PUBLIC ${ARG_PUBLIC_DEPENDS} PRIVATE ${ARG_PRIVATE_DEPENDS})
  troupe_set_warnings(${target})
  if(TROUPE_UNITY_BUILD)
    # Batches of 8 sources per compiler run: the headers they share (the standard library,
    # Asio, CAF) are parsed once per batch. A source included by a batch is no longer the
    # main file, so GCC's -Wsubobject-linkage would flag every anonymous-namespace type.
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-subobject-linkage>)
  endif()
  install(TARGETS ${target} EXPORT troupe_targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  if(ARG_HEADERS)
    install(FILES ${ARG_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe/${name})
  endif()
endfunction()

# A folder whose module has no code yet: an interface target that states its layering.
function(troupe_add_empty_module name)
  cmake_parse_arguments(ARG "" "" "DEPENDS" ${ARGN})
  set(target troupe_${name})
  add_library(${target} INTERFACE)
  add_library(troupe::${name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  target_link_libraries(${target} INTERFACE ${ARG_DEPENDS})
  install(TARGETS ${target} EXPORT troupe_targets)
endfunction()
