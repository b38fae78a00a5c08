# A stand-in for an installed LibTorch's version file (what configure reads).
set(PACKAGE_VERSION "2.15.0")
set(PACKAGE_VERSION_COMPATIBLE TRUE)
