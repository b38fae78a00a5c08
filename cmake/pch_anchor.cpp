// Anchor for the shared precompiled torch header; intentionally empty.
