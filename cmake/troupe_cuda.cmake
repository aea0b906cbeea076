# Finds CUDA's runtime and NCCL (under /usr/local/cuda by default). TROUPE_WITH_CUDA=AUTO
# builds the GPU code when both are found, ON requires them, OFF skips them.
# Only libcudart and libnccl are linked, never the driver stub.
set(TROUPE_HAVE_CUDA OFF)
if(NOT TROUPE_WITH_CUDA STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  find_path(TROUPE_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_ROOT}/include)
  find_library(TROUPE_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_ROOT}/lib64)
  if(CUDAToolkit_FOUND AND TROUPE_NCCL_INCLUDE_DIR AND TROUPE_NCCL_LIBRARY)
    set(TROUPE_HAVE_CUDA ON)
    message(STATUS "troupe: GPU code enabled (CUDA ${CUDAToolkit_VERSION} at "
                   "${CUDAToolkit_LIBRARY_DIR}, NCCL at ${TROUPE_NCCL_LIBRARY})")
    if(NOT TARGET troupe_nccl_imported)
      add_library(troupe_nccl_imported UNKNOWN IMPORTED GLOBAL)
      set_target_properties(troupe_nccl_imported PROPERTIES
        IMPORTED_LOCATION ${TROUPE_NCCL_LIBRARY}
        INTERFACE_INCLUDE_DIRECTORIES ${TROUPE_NCCL_INCLUDE_DIR})
    endif()
  else()
    set(_why "")
    if(NOT CUDAToolkit_FOUND)
      string(APPEND _why " the CUDA toolkit (cuda_runtime.h, libcudart) was not found;")
    endif()
    if(NOT TROUPE_NCCL_INCLUDE_DIR OR NOT TROUPE_NCCL_LIBRARY)
      string(APPEND _why " NCCL (nccl.h, libnccl) was not found;")
    endif()
    if(TROUPE_WITH_CUDA STREQUAL "ON")
      message(FATAL_ERROR "troupe: TROUPE_WITH_CUDA=ON but${_why} set CUDAToolkit_ROOT "
                          "to the toolkit's folder or configure with -DTROUPE_WITH_CUDA=OFF.")
    endif()
    message(STATUS "troupe: GPU code disabled:${_why} building CPU-only. "
                   "Set CUDAToolkit_ROOT to enable it, or -DTROUPE_WITH_CUDA=OFF to silence this.")
  endif()
endif()
