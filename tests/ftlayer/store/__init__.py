"""Tests of ftlayer/store/."""
