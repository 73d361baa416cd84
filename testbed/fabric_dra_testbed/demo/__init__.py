"""The local end-to-end demo: the composable-DRA article's scenario on one machine."""
