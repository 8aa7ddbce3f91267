pub mod host_container;
