# Emulated builds of the AMX and AVX-512 micro-kernels, so their logic is tested on CPUs that lack
# the ISA (this machine: AVX2 only). Each is its own module with the SAME micro-kernel source and the
# same driver (ops/, bindings.cpp: ${HINA_OPERATOR_SOURCES}), compiled WITHOUT any AMX/AVX-512 flag:
#   hinabench._C_amx_emu     microkernel_amx.cpp against kernels/emu/tile_emulator.h    isa "amx-emulated"
#   hinabench._C_avx512_emu  microkernel_avx512.cpp against SIMDe's portable AVX-512 isa "avx512-emulated"
# The micro-kernel files carry per-file ISA flags in CMakeLists.txt (source properties are per
# directory, so they would follow the file into these targets); the emulated targets therefore
# compile one-line wrappers that #include the very same source files.
set(HINA_EMU_DIR "${CMAKE_CURRENT_BINARY_DIR}/emulated")
# One wrapper per source (CMakeLists.txt's hina_wrappers): the micro-kernels (microkernel.h), the
# quantized ones (quant.h) and attention's (ops/attention.h).
hina_wrappers(_emu_sources "${HINA_EMU_DIR}" emulated amx/microkernel_amx amx/quant_amx amx/attention_amx
              avx512/microkernel_avx512 avx512/quant_avx512 avx512/attention_avx512)
# and the AVX-512 sources' build without AVX512_BF16 (kernels/isa/avx512/dpbf16.h), "avx512-nobf16-emulated"
hina_wrappers(HINA_EMU_NOBF16_SOURCES "${HINA_EMU_DIR}" emulated_nobf16
              avx512/microkernel_avx512 avx512/quant_avx512 avx512/attention_avx512)
set_source_files_properties(${HINA_EMU_NOBF16_SOURCES} PROPERTIES COMPILE_DEFINITIONS HINA_AVX512_NOBF16)

# ---- AMX on the software tile unit ----------------------------------------------------------------
pybind11_add_module(_C_amx_emu NO_EXTRAS
  ${HINA_OPERATOR_SOURCES}
  "${HINA_EMU_DIR}/microkernel_amx_emulated.cpp"
  "${HINA_EMU_DIR}/quant_amx_emulated.cpp"
  "${HINA_EMU_DIR}/attention_amx_emulated.cpp")
target_include_directories(_C_amx_emu PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}/kernels")
target_compile_definitions(_C_amx_emu PRIVATE HINA_EMU_AMX HINA_EMU_MODULE_NAME=_C_amx_emu)
# The emulator spells out every rounding step (std::fma); keep the compiler from contracting others.
target_compile_options(_C_amx_emu PRIVATE -ffp-contract=off)
target_link_libraries(_C_amx_emu PRIVATE OpenMP::OpenMP_CXX)
install(TARGETS _C_amx_emu DESTINATION hinabench)

# ---- AVX-512 on SIMDe (header-only, from the build requirement simde-py) ---------------------------
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c "import simde_py; print(simde_py.get_include())"
  OUTPUT_VARIABLE HINA_SIMDE_INCLUDE OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE _simde_rc ERROR_QUIET)
if(_simde_rc EQUAL 0 AND EXISTS "${HINA_SIMDE_INCLUDE}/simde/x86/avx512.h")
  pybind11_add_module(_C_avx512_emu NO_EXTRAS
    ${HINA_OPERATOR_SOURCES}
    "${HINA_EMU_DIR}/microkernel_avx512_emulated.cpp"
    "${HINA_EMU_DIR}/quant_avx512_emulated.cpp"
    "${HINA_EMU_DIR}/attention_avx512_emulated.cpp"
    ${HINA_EMU_NOBF16_SOURCES})
  target_include_directories(_C_avx512_emu PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}/kernels")
  target_include_directories(_C_avx512_emu SYSTEM PRIVATE "${HINA_SIMDE_INCLUDE}")
  target_compile_definitions(_C_avx512_emu PRIVATE HINA_EMU_AVX512 HINA_EMU_MODULE_NAME=_C_avx512_emu)
  target_compile_options(_C_avx512_emu PRIVATE -Wno-psabi)  # SIMDe passes 64-byte vectors by value
  target_link_libraries(_C_avx512_emu PRIVATE OpenMP::OpenMP_CXX)
  install(TARGETS _C_avx512_emu DESTINATION hinabench)
  message(STATUS "hinabench: _C_avx512_emu built against SIMDe at ${HINA_SIMDE_INCLUDE}")
else()
  message(WARNING "hinabench: SIMDe headers not found (pip install simde-py); "
                  "_C_avx512_emu is not built and the avx512-emulated tests will skip")
endif()
