//! Helpers shared by the end-to-end tests: temporary sockets, synthetic models, daemon processes.
