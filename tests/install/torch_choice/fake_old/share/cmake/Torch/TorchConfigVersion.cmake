# A stand-in for an installed LibTorch's version file (what configure reads).
set(PACKAGE_VERSION "1.12.1")
set(PACKAGE_VERSION_COMPATIBLE TRUE)
