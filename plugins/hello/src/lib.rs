//! The hello example plugin.
