"""Tests of ftlayer/facade/."""
