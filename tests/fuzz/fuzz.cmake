# tests/fuzz/fuzz.cmake - the libFuzzer targets (tests/fuzz/README.md),
# included by the top CMakeLists.txt.
#
# One program per door, fz_NAME from fz_NAME.c. With -DQI_FUZZ=ON (clang)
# they link libFuzzer and everything is built for it (coverage, ASan,
# UBSan): tests/fuzz/campaign.sh and tests/fuzz/burst.sh run them. In any
# other build they link driver.c, a main that replays files, and CTest
# entry fuzz_replay_NAME replays the seeds, the grown corpus and every
# regression input (tests/fuzz/seeds/NAME, corpus/NAME, regress/NAME) on
# every build: a bug found once stays found.
#
# The gguf and merge targets' seeds are binary (GGUF models, results
# databases): they are written at build time into ${CMAKE_BINARY_DIR}/fuzz-seeds
# by tests/fuzz/make_seeds.sh (`qinfer synth` and fz_merge's own writer),
# which CTest runs as fixture fuzz_seeds before the replays that need them
# (gguf, merge, and lua, whose model is gguf/llama.gguf there).
set(QI_FZ_DIR ${CMAKE_SOURCE_DIR}/tests/fuzz)
set(QI_FZ_GEN ${CMAKE_BINARY_DIR}/fuzz-seeds)
set(QI_FZ_TARGETS gguf tok_bpe tok_spm hwprofile simcal nprofile sparsity)
if(QI_HAVE_HARNESS)
  list(APPEND QI_FZ_TARGETS plan json merge)
endif()
if(QI_HAVE_LUA)
  list(APPEND QI_FZ_TARGETS lua)
endif()
if(MHD_FOUND AND CJSON_FOUND)
  list(APPEND QI_FZ_TARGETS serve http)
endif()

set(QI_FZ_ALL "")
foreach(t ${QI_FZ_TARGETS})
  set(src ${QI_FZ_DIR}/fz_${t}.c ${QI_FZ_DIR}/fz_util.c ${QI_FZ_DIR}/fz_vocab.c)
  if(NOT QI_FUZZ)
    list(APPEND src ${QI_FZ_DIR}/driver.c)
  endif()
  add_executable(fz_${t} ${src})
  target_include_directories(fz_${t} PRIVATE ${QI_FZ_DIR} ${QI_ENGINE_PRIVATE_INC} ${CMAKE_SOURCE_DIR}/policies
                             ${CMAKE_SOURCE_DIR}/engine/harness ${CMAKE_SOURCE_DIR}/engine/cli)
  target_link_libraries(fz_${t} PRIVATE qinfer_engine)
  if(QI_FUZZ)
    target_link_options(fz_${t} PRIVATE -fsanitize=fuzzer)
  endif()
  list(APPEND QI_FZ_ALL fz_${t})
  if(t MATCHES "^(gguf|merge)$")
    set(seeds ${QI_FZ_GEN}/${t})
  else()
    set(seeds ${QI_FZ_DIR}/seeds/${t})
  endif()
  add_test(NAME fuzz_replay_${t} COMMAND fz_${t} -runs=0 ${seeds} ${QI_FZ_DIR}/corpus/${t} ${QI_FZ_DIR}/regress/${t})
  set_tests_properties(fuzz_replay_${t} PROPERTIES LABELS fuzz TIMEOUT 120)
  if(t MATCHES "^(gguf|merge|lua)$")
    set_tests_properties(fuzz_replay_${t} PROPERTIES FIXTURES_REQUIRED fuzz_seeds)
  endif()
endforeach()
if(TARGET fz_merge)
  set(QI_FZ_MERGE_EXE $<TARGET_FILE:fz_merge>)
else()
  set(QI_FZ_MERGE_EXE -)
endif()
add_test(NAME fuzz_seeds COMMAND bash ${QI_FZ_DIR}/make_seeds.sh $<TARGET_FILE:qinfer> ${QI_FZ_MERGE_EXE} ${QI_FZ_GEN})
set_tests_properties(fuzz_seeds PROPERTIES LABELS fuzz FIXTURES_SETUP fuzz_seeds TIMEOUT 120)
if(TARGET fz_plan)
  target_link_libraries(fz_plan PRIVATE qinfer_harness)
  target_link_libraries(fz_json PRIVATE qinfer_harness)
  target_link_libraries(fz_merge PRIVATE qinfer_harness PkgConfig::SQLITE3)
endif()
if(TARGET fz_lua)
  target_include_directories(fz_lua PRIVATE ${CMAKE_BINARY_DIR}/generated)
  target_link_libraries(fz_lua PRIVATE qinfer_lua)
  target_compile_definitions(fz_lua PRIVATE QI_FZ_LUA_MODEL_PATH="${QI_FZ_GEN}/gguf/llama.gguf")
endif()
if(TARGET fz_serve)
  # the server's request parser and its request queue, as qinfer links
  # them; and its HTTP daemon
  target_sources(fz_serve PRIVATE ${CMAKE_SOURCE_DIR}/engine/cli/serve_api.c ${CMAKE_SOURCE_DIR}/engine/cli/serve_loop.c)
  target_sources(fz_http PRIVATE ${CMAKE_SOURCE_DIR}/engine/cli/serve_api.c ${CMAKE_SOURCE_DIR}/engine/cli/serve_loop.c
                 ${CMAKE_SOURCE_DIR}/engine/cli/serve_http.c)
  target_compile_definitions(fz_serve PRIVATE QI_HAVE_SERVE=1)
  target_compile_definitions(fz_http PRIVATE QI_HAVE_SERVE=1)
  target_link_libraries(fz_serve PRIVATE PkgConfig::CJSON)
  target_link_libraries(fz_http PRIVATE PkgConfig::CJSON PkgConfig::MHD)
endif()
add_custom_target(fuzz_targets DEPENDS ${QI_FZ_ALL})
