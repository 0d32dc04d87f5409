// shardopt-train: the --save-params file (its format: docs/train.md), and
// the checks before training that the files a run writes can be written.
#pragma once

#include <cstdint>
#include <string>

#include "model.hpp"

namespace train {

// Writes FILE.tmp and renames it to FILE, so that FILE is either the old
// file or the whole new one. Returns an error message, empty on success.
std::string save_params(const std::string& path, const ModelTensors& m, std::int64_t steps);

// Before training: fails early where FILE.tmp cannot be created.
std::string check_writable(const std::string& path);

// Before training: fails early where no file can be created beside PATH
// (checkpoints and exports are written under a temporary name in PATH's
// directory, then renamed to PATH).
std::string check_directory(const std::string& option, const std::string& path);

// Before training, without --resume or --overwrite: "" if nothing is at
// --checkpoint PATH (or a directory, which no save can replace), else why
// the run must not start: the file, the step it holds (from its header),
// or that it is not a readable checkpoint, and the two ways on.
std::string overwrite_refusal(const std::string& path);

}  // namespace train
