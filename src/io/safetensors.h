// safetensors files opened by mmap and fully validated before any tensor is handed out, and a model's
// set of shards (single file or model.safetensors.index.json) as one name -> tensor store.
#pragma once
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace moecel {

// One .safetensors file. Validation (all failures throw moecel::Error naming the file and tensor):
// header length vs file size (and a sane cap), header JSON, dtype known, shape non-negative, dtype x shape ==
// byte range, ranges inside the data area, no overlaps, no duplicate names.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  const std::string& path() const { return path_; }
  // Tensors are CPU views into the mapping; they keep the mapping alive.
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes a safetensors file (used by make-test-model and tests). Tensors are host tensors.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// All tensors of a model folder: model.safetensors, or the shards listed by model.safetensors.index.json
// (each listed file must exist and hold exactly the tensors the index assigns to it), or every *.safetensors.
class WeightStore {
 public:
  static WeightStore open_folder(const std::string& dir);
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws "missing tensor NAME in DIR" when absent. Marks the tensor as used.
  const Tensor& get(const std::string& name) const;
  const std::map<std::string, Tensor>& all() const { return tensors_; }
  // Names never fetched with get() (for "unexpected tensor" checks after a model binds its weights).
  std::vector<std::string> unused() const;
  const std::string& dir() const { return dir_; }
  // Which file holds a tensor (for messages).
  const std::string& file_of(const std::string& name) const;

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> file_of_;
  mutable std::set<std::string> used_;
};

}  // namespace moecel
