// Everything public in one include.
#pragma once

#include "tilelab/attention.hpp"
#include "tilelab/blocksparse.hpp"
#include "tilelab/error.hpp"
#include "tilelab/paged.hpp"
#include "tilelab/tensor.hpp"
#include "tilelab/threading.hpp"
#include "tilelab/version.hpp"
