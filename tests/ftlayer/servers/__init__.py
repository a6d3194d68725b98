"""Tests of ftlayer/servers/."""
