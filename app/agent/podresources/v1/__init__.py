"""PodResources API v1: upstream api.proto and its stubs (scripts/gen-deviceplugin)."""
