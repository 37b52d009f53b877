//! Checkpoint loading: local directories and Hub ids.
