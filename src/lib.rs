//! tilegrad
