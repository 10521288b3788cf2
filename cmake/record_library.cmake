# Run at install time (install(CODE) in ja_install_library): writes <library>.record next to an installed library,
# {"size": bytes, "sha256": hex}. jax_aiter/_native.py compares the file against it before loading, so a truncated
# or altered library disables its backend with a warning instead of crashing the process.
file(SIZE "${JA_RECORD_LIBRARY}" ja_size)
file(SHA256 "${JA_RECORD_LIBRARY}" ja_sha256)
file(WRITE "${JA_RECORD_LIBRARY}.record" "{\"size\": ${ja_size}, \"sha256\": \"${ja_sha256}\"}\n")
message(STATUS "Recorded: ${JA_RECORD_LIBRARY}.record")
