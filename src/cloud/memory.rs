//! In-memory ASGs for the demo, the tests and CA developers.
