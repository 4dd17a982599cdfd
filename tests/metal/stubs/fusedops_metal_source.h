// Stand-in for the header setup.py generates on macOS (metal/kernels as one MSL string).
#pragma once

static const char kMetalSource[] = "";
