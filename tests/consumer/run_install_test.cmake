file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}"
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
# Every component's headers are installed, distributed/ included, and detail/ (the machinery
# rpc.hpp includes); nothing of an internal/ folder is.
foreach(_h dopt/optim/adam.hpp dopt/distributed/zero.hpp dopt/distributed/reducer.hpp
           dopt/distributed/post_local_sgd.hpp dopt/distributed/distributed_optimizer.hpp
           dopt/distributed/checkpointer.hpp dopt/actors/detail/rpc_calls.hpp)
  if(NOT EXISTS "${prefix}/include/${_h}")
    message(FATAL_ERROR "the installed package lacks include/${_h}")
  endif()
endforeach()
file(GLOB_RECURSE _internal RELATIVE "${prefix}/include" "${prefix}/include/dopt/*/internal/*")
if(_internal)
  message(FATAL_ERROR "the installed package holds internal headers: ${_internal}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/build"
                        -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/build" RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
execute_process(COMMAND "${WORK_DIR}/build/consumer" RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the consumer failed: ${rc}")
endif()
