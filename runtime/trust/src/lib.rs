//! Plugin trust: digests and signatures.
