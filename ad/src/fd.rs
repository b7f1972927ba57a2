//! Central finite differences through the reference interpreter, in f64: the engine's self-check.
