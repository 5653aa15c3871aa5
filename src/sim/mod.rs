//! An in-memory Kubernetes API server over HTTP, with a fake kubelet and controllers,
//! for the demo and the tests.
