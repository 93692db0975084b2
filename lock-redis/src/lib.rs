//! distlock backend crate (being written).
