//! The Unix-socket server: accept loop, per-connection framing, handshake, dispatch to the engine.
