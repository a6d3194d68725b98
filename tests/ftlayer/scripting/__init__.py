"""Tests of ftlayer/scripting/."""
